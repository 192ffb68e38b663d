WHAT = "a prompt waits for a step with budget for all of it instead of being chunked"
CHAPTER = "03"
EDITS = [("return min(request.num_uncomputed_tokens, self.token_budget)",
          "return request.num_uncomputed_tokens if request.num_uncomputed_tokens <= "
          "self.token_budget else 0")]
CHECKS = "ch03 and step_by_step and chunked"
