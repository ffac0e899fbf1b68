"""Security administration above the memory core: the cluster connection and its credentials (`connection`),
secrets files (`secrets`), per-user DLS keys and the tenancy hook they plug into a store (`tenancy`),
Atlas-issued tokens (`tokens`), the cluster index that keeps both for every server (`credentials`), and privacy:
erase, export, import (`privacy`)."""
