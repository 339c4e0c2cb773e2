"""Load testing and fault drills against a running Tenure deployment (see loadtest/README.md)."""
