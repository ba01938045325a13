"""WebSocket subscriptions (eth_subscribe) on the edge: hubs, sessions, filters."""
