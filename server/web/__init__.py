"""tickwire.server.web: the browser side of the server. The port splitter (gRPC and HTTP/1.1 on one
port), Deephaven's JavaScript API and grid page served from the installed deephaven-server
package, and gRPC over the `grpc-websockets-multiplex` websocket run by the same handlers as the
gRPC port."""
from tickwire.server.web.assets import MISSING_ASSETS, AssetSource, locate_assets
from tickwire.server.web.multiplex import MultiplexSocket
from tickwire.server.web.site import SUBPROTOCOL, WebSide
from tickwire.server.web.splitter import HTTP2_PREFACE, PortSplitter, classify

__all__ = ["WebSide", "PortSplitter", "MultiplexSocket", "AssetSource", "locate_assets", "MISSING_ASSETS",
           "SUBPROTOCOL", "HTTP2_PREFACE", "classify"]
