"""The benchmark conversation of `pairs` user/assistant turn pairs (BenchmarkChatTTFT builds the same one
in Go: ttft_bench_test.go benchConversation). Kept tiny and deterministic so three tools agree on it."""

SYSTEM = "You are the maintenance assistant of a water treatment plant. Answer from the log."


def sentence(i):
    return ("The committee reviewed section %d of the maintenance log and noted that valve %d was inspected, "
            "cleaned and resealed before the afternoon shift. " % (i, i % 17))


def messages(pairs):
    out = [{"role": "system", "content": SYSTEM}]
    for k in range(pairs):
        out.append({"role": "user", "content": "Question %d: " % k + "".join(sentence(3 * k + j) for j in range(3))})
        out.append({"role": "assistant", "content": "".join(sentence(3 * k + j + 1000) for j in range(3))})
    out.append({"role": "user", "content": "Summarise what was done to valve 3."})
    return out
