"""``retry-webhook serve``: HTTPS (granian workers run by our supervisor), the Flask app,
Prometheus metrics, JSON logs, and reload of the mounted certificate and config."""
