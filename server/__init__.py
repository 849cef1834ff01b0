"""tickwire.server"""
