"""Which instance serves a request: the routing table (fed by the controller's stream or a static
worker list), the router's steps — filters (roles, excluded instances, versions, the traffic
split between versions), then the model's policy, which picks — and the policies."""
