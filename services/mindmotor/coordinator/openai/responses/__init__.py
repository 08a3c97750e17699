"""OpenAI's Responses API (`/v1/responses`) on the chat completions path: a request becomes a chat
request (`request.py`), its results and stream become a response object and Responses events
(`output.py`), and stored responses (`store.py`) carry a conversation across `previous_response_id`."""
