"""The hub-managed service: admin and user pages, their JSON API, the watches and threads behind them."""
