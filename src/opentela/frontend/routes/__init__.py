"""HTTP routes of the frontend: the OpenAI surface, management, and the dashboard."""
