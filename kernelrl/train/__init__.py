"""The learner: SFT-set collection, SFT, rejection-sampling fine-tuning and contrastive GRPO on TRL.

See README.md in this folder. Nothing is imported here, so importing a submodule (the reward
function, say) does not pull in TRL or transformers until it is used.
"""
