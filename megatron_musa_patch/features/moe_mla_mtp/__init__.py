"""DeepSeek-style MoE, MLA and MTP: device-level balance and routing variants, MLA on the local
spec, MT-Megatron's MTP flag spellings."""
