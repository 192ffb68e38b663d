"""The HTTP side of the engine: the async engine, the OpenAI-compatible server and its protocol,
API keys, streaming detokenisation, Prometheus metrics, and a load generator for any
OpenAI-compatible server."""
