"""Evidence: a controlled HTTP benchmark client, telemetry, evidence bundles, a fail-closed validator
and reports. It talks to servers over HTTP only and never imports engine internals, so it measures any
implementation (ours or a peer) the same way."""
