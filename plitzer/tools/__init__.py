"""What a person runs besides the CLI: explain and locate, the demo, sample text, mixture files."""
