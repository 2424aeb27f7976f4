"""Running a node: its process, the status endpoint and page, doctor and its resource
estimate, export, and the run's charts."""
