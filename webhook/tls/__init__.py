"""Serving certificates: made locally for development (``certs``), or kept in step with
the webhook configurations' caBundles in a cluster (``incluster``)."""
