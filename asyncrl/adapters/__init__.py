"""LoRA adapters: their wire format, their merge into base weights, and reading a model folder's weights by name.

Pure torch and safetensors: shared by the trainer (`asyncrl.training.lora`), the generation workers
(`asyncrl.generation.lora_merge`) and export (`asyncrl.models.lora_export`) without tying those packages together.
"""
