"""Chapter 09 exercise: a router's policy, prefix affinity bounded by load.

Every replica keeps its own prefix cache, so where a request goes decides what it costs: a
chat's next turn repeats its whole history, cheap on the replica that served the last turn and
full price on any other. A router that remembers what it sent where can send the next turn back:

    replica 0 was sent  "system A | user: hi | assistant: hello"
    replica 1 was sent  "system B | user: what is 2+2?"
    a new prompt        "system A | user: hi | assistant: hello | user: and you?"
    longest match       replica 0 (the whole earlier prompt), replica 1 (nothing): go to 0

Your router replaces the proxy's `route` function of the chapter: one call per request, in the
order the requests arrive, returning the replica's index. The grader replays the book's seeded
multi-turn trace through it into two real minicb replicas with prefix caching, and their cache
hit rate must equal what vLLM's router (cache_aware) reached on the same trace.

Grade it: make grade CH=09
"""

from __future__ import annotations


def common_prefix_length(a: str, b: str) -> int:
    """How many leading characters `a` and `b` share.

    >>> common_prefix_length("system A | hi", "system A | bye")
    11
    >>> common_prefix_length("abc", "abc"), common_prefix_length("", "abc")
    (3, 0)
    >>> common_prefix_length("x", "y")
    0
    """
    # BEGIN SOLUTION: count the characters from the start until the two strings differ
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
    # END SOLUTION


class PrefixAffinityRouter:
    """Send each prompt to the replica holding the longest prefix of it, unless that is too little
    of the prompt, or that replica is too far ahead of the others in requests.

    `threshold`: the share of the prompt (in characters) a replica's best match must cover to
    count (vLLM's router defaults to 0.3). `max_imbalance`: how many more requests the matched
    replica may have been sent than the least-sent one before the router balances instead.
    """

    def __init__(self, num_replicas: int, threshold: float = 0.3, max_imbalance: int = 8):
        if num_replicas < 1:
            raise ValueError(f"a router needs at least one replica (got {num_replicas}).")
        self.threshold, self.max_imbalance = threshold, max_imbalance
        self.sent: list[list[str]] = [[] for _ in range(num_replicas)]  # the prompts each was sent

    def least_sent(self) -> int:
        """The replica that was sent the fewest requests (the lowest index on a tie)."""
        counts = [len(prompts) for prompts in self.sent]
        return counts.index(min(counts))

    def route(self, prompt: str) -> int:
        """The replica for `prompt`, remembered as sent there.

        1. match[r] = the longest common prefix of `prompt` with any prompt replica r was sent
           (0 when it was sent none); best = the replica with the largest match (the lowest
           index on a tie).
        2. If match[best] < threshold * len(prompt), nobody holds enough of it: the least-sent
           replica instead (`least_sent`), so new conversations spread out.
        3. If best was sent more than `max_imbalance` requests more than the least-sent replica,
           the least-sent replica instead: affinity must not pile everything on one replica.
        4. Record the prompt as sent to the chosen replica, and return its index.

        >>> router = PrefixAffinityRouter(2)
        >>> router.route("You are terse. | user: hi")
        0
        >>> router.route("Answer in French. | user: 2+2?")
        1
        >>> router.route("You are terse. | user: hi | assistant: hello | user: and you?")
        0
        >>> router.route("something else entirely")      # no match: the least-sent replica
        1
        >>> tight = PrefixAffinityRouter(2, max_imbalance=1)
        >>> [tight.route("same start " + str(i)) for i in range(5)]
        [0, 0, 1, 0, 1]
        """
        # BEGIN SOLUTION: best match, else least sent (match too short or too far ahead); record it
        match = [max((common_prefix_length(prompt, p) for p in prompts), default=0)
                 for prompts in self.sent]
        best = match.index(max(match))
        least = self.least_sent()
        if (match[best] < self.threshold * len(prompt)
                or len(self.sent[best]) - len(self.sent[least]) > self.max_imbalance):
            best = least
        self.sent[best].append(prompt)
        return best
        # END SOLUTION
