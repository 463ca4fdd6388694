"""qwen3-tts-native: a fast, exact serving engine for Qwen3-TTS-12Hz-1.7B-VoiceDesign."""

__version__ = "0.1.0"
