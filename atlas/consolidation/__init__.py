"""Episodes become facts and playbooks: proposers (rule-based offline, or an LLM) and the guards,
plans and watermarks that decide what is written (`consolidate`)."""
