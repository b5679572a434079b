"""A FastAPI service that hands over to its next generation with nothing lost."""
