"""What the server keeps of the cluster through list-and-watch caches, so that no
admission waits on the API server: Jobs' attempts and failure history, training runtimes."""
