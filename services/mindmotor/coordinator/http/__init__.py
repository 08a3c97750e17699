"""The HTTP side of the front door: the server (uvicorn, replicas on one socket), the middleware
every request passes (request id, API key, rate limit, body limit), errors in OpenAI's shape,
server-sent events, the event-loop lag monitor and the routes."""
