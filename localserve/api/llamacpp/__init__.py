"""llama.cpp server's `/infill` dialect, for editors' code completion."""
