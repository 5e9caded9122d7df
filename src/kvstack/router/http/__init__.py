"""The router's HTTP front end: the ASGI app, its server, request parsing, responses, API keys."""
