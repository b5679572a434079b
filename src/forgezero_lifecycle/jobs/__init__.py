"""See the package docstring of forgezero_lifecycle for the layering."""
