"""Atlas behind other frameworks' memory interfaces, each in its own module and extra.

`atlas.integrations.langgraph`: `AtlasStore`, LangGraph's `BaseStore` (`pip install 'atlas-memory[langgraph]'`).
Nothing here is imported by the rest of Atlas, so the base install never needs a framework.
"""
