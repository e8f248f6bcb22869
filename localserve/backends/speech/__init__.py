"""Speech recognition: what every Whisper backend shares, faster-whisper and whisper.cpp."""
