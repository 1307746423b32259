"""gradstore's Flower example: a ServerApp with GradstoreStrategy and a ClientApp with GradstoreClient."""
