"""Client-side tools that measure any OpenAI-compatible endpoint: the `otela bench load` generator."""
