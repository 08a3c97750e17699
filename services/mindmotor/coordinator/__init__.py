"""The Coordinator: the OpenAI-compatible HTTP front door.

A request goes through `middleware` (request id, auth and rate limit, body limit), a thin route in
`routes/`, then `completions`/`chat` build one `Generation` per choice: the `Router` picks an
instance (deployment traffic weights first, then the model's policy from `policies/`), and the
generation streams tokens from that worker over gRPC, resubmitting elsewhere (the tokens already
produced go along as a continuation) when the worker fails. `routing_table.RoutingTable` is what the router reads;
`static_source` fills it from `--worker` addresses (a controller adapter can fill it instead).
`models.ModelCatalog` holds each model's tokenizer: from its local checkpoint directory, or learnt
from its workers by `discovery`.
"""
