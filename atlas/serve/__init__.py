"""Memory for agents: the three tools (`tools`), the MCP server (`mcp_server`), the agent loop
(`agent`) and its OpenAI-compatible client (`llm`)."""
