"""The terminal chat (`gguf-chat chat`), built on textual."""
