WHAT = "returns minicb's torch reference instead of launching a Triton kernel"
CHAPTER = "05"
EDITS = [("    out = torch.empty_like(q)\n    paged_decode_kernel[",
          "    from minicb.kernels import paged_attention_reference\n"
          "    cu = torch.arange(num_seqs + 1, dtype=torch.int32, device=q.device)\n"
          "    return paged_attention_reference(q, k_cache, v_cache, cu, seq_lens, block_tables, "
          "scale, 1, int(seq_lens.max()))\n"
          "    out = torch.empty_like(q)\n    paged_decode_kernel[")]
CHECKS = "ch05 and triton"
