"""The orders service's Django app: models (the tables the service makes), views and URLs."""
