"""Headless Chromium for interop tests: `cdp` starts it and drives it over the DevTools protocol,
`jsapi` runs Deephaven's JavaScript API (`/jsapi/dh-core.js`, served by the server under test) in a
page and reads what it holds."""
