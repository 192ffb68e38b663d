WHAT = "forgets to rescale the running sums when the max moves (alpha)"
CHAPTER = "05"
EDITS = [("alpha = tl.exp(m_i - m_new)", "alpha = tl.exp(m_i - m_i)")]
CHECKS = "ch05 and matches_the_reference"
