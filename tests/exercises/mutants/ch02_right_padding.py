WHAT = "pads on the right instead of the left"
CHAPTER = "02"
EDITS = [("input_ids[row, longest - len(prompt):] =", "input_ids[row, :len(prompt)] ="),
         ("attention_mask[row, longest - len(prompt):] = 1",
          "attention_mask[row, :len(prompt)] = 1")]
CHECKS = "ch02 and (worked or padding_and_positions)"
