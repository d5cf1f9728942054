"""The model contract: how a conversation and its tool calls are written for the model
(``wire``, ``chat_format``, ``special_tokens``), and what the llama.cpp server process
runs (``shim``, ``choice``, ``prompt_cache``). The trainer renders its training text
with the same code, so the day and the night read one format."""
