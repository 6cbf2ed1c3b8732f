"""What a model is shown and how its turns go: prompts, refinement episodes, the turn loop, feedback.

Shared by the search, the trainer, the bench and the reward server's sessions; see README.md.
"""
