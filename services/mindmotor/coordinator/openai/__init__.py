"""The OpenAI API, one module per concern: the request schemas, the two generation endpoints
(`completions`, `chat`), their prompts (tokenized off the event loop), sampling options, structured
outputs and tools, and each endpoint's output format (JSON body and stream chunks)."""
