"""What runs cost and who used what: metering, prices, running totals, billing, and the database they live in."""
