"""Serving trained policies: an HTTP inference server over exported policies (no Ray, no RLlib),
with dynamic batching and hot reload, and a Ray Serve deployment of the same API for scale."""
