"""The SGLang target: ``_post_process_topk_ids`` of ``sglang.srt.layers.moe.topk``."""
