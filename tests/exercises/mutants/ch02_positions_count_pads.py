WHAT = "positions count the pads too (0, 1, 2, ... along every row)"
CHAPTER = "02"
EDITS = [("return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)",
          "return torch.arange(attention_mask.shape[-1]).expand(attention_mask.shape).clone()")]
CHECKS = "ch02 and (worked or padding_and_positions)"
