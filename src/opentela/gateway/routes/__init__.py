"""HTTP routes of the ingress: OpenAI inference routes and read-only infrastructure routes."""
