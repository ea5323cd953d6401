"""What the offline commands (``dry-run``, ``explain``, ``test``) share: manifests read from
files, directories and stdin with where each object came from (``inputs``), each object
prepared and reviewed as the API server would (``review``), and the reports CI systems
read (``reports``: JUnit XML, SARIF)."""
