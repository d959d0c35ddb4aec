"""MCP servers for the chat window: their config file, and a hub that connects to them and runs their tools."""
