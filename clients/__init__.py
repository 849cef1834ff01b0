"""tickwire.clients"""
