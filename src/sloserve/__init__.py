"""sloserve."""
