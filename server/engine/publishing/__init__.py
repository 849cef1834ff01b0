"""tickwire.server.engine.publishing: publishing tables to Barrage subscribers (deltas, viewports, snapshots)."""
from tickwire.server.engine.publishing.handle import SubscriptionHandle, Waker, encoded_payloads
from tickwire.server.engine.publishing.messages import EncodeOptions, Message, TableWire, metadata_bytes
from tickwire.server.engine.publishing.publisher import (
    DogetSnapshot,
    Publisher,
    PublisherRegistry,
    Subscriber,
    snapshot_message,
)
from tickwire.server.engine.publishing.views import (
    Plan,
    SubscriptionError,
    View,
    Viewport,
    plan_full,
    plan_viewport,
    window_keys,
)

__all__ = [
    "EncodeOptions", "Message", "TableWire", "metadata_bytes",
    "DogetSnapshot", "Publisher", "PublisherRegistry", "Subscriber", "SubscriptionError", "snapshot_message",
    "Plan", "View", "Viewport", "plan_full", "plan_viewport", "window_keys",
    "SubscriptionHandle", "Waker", "encoded_payloads",
]
