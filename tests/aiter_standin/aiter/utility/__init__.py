"""Stand-in for ``aiter.utility`` (only ``dtypes``)."""
