"""How a request becomes a generation: the choice of models, K and drafter, the bench memo,
the loaded pair, the generation itself, batches, prompts and chat templates."""
