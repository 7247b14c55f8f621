/* The cost model (see cost.h). Formulas, with p ranks, n bytes, L = ceil(log2 p),
 * P = the largest power of two <= p, x = 1 when p is not a power of two:
 *
 * allreduce  ring    2(p-1) a + 2(p-1)/p n b + (p-1)/p n g / k    (k: chunks a ring block
 *                    pipelines, at most 4: reducing a chunk overlaps sending the next)
 *            rd      log2(P) (a + n b + n g) + x (2 a + 2 n b + n g)   (fold in and out)
 *            hd      2 log2(P) a + 2(P-1)/P n b + (P-1)/P n g + x (2 a + 2 n b + n g)
 *            dbtree  2 (L + c - 1) a + 2 n b + n g     (c chunks through the trees; each
 *                    rank receives up to the whole vector and sends it on)
 *            linear  2 a + 2 (p-2) a/4 + (p-1) n (b + g)   (every rank to rank 0, which
 *                    reduces the p - 1 vectors in turn and sends the result back)
 *            On a crowded host ring, rd, hd, dbtree and linear count their latency as
 *            the barrier's below, with 2 p (p-1), P log2(P) + 2 (p-P), 2 P log2(P) + 2
 *            (p-P), 4 (p-1) c and 2 (p-1) messages: 4 ranks on
 *            2 CPUs, p50 us, linear against rd: shm 4 B 2.2-3.2 against 3.5-3.9, 4 KiB
 *            5.9-6.4 against 7.9-8.4; tcp 4 B 13.0 against 20.9, 4 KiB 16.9 against 25.2
 *            (over tcp linear was picked to 10 KiB until session 53: below). Over
 *            shm, crowded, linear's root copies at b/3 (root_copy_b): the linear
 *            allreduce grew 0.4 ns a byte from 16 to 64 KiB (the model 0.45, at b 0.85);
 *            and the others' bytes count at ranks / CPUs there too (steps_crowd, session
 *            68: 4 ranks on 2 CPUs, --algo all --fresh --window, 10 runs, medians of the
 *            runs' hd / linear 1.20-1.31 at 24-32 KiB, 1.01-1.12 at 48-96, 1.00 at 128,
 *            0.75-0.83 at 192-256; 8 ranks, 3 runs, linear the fastest at 16-128 KiB in
 *            every run, where the model had dbtree from 16 KiB at 1.36-2.48x its time):
 *            linear is picked to 85 KiB (51 KiB until then), while its 3 n fit the
 *            root's cache (at 8 ranks to 32 KiB, then hd at 1.13-1.56x linear's time:
 *            its 7 vectors outgrow that cache sooner than its time grows).
 *            hd's messages: over shm 4 ranks, 1 KiB, took
 *            7.6-8.5 us (its rounds said 4.4); over tcp 56-148 us at 16 B-16 KiB,
 *            1.5-3x linear's.
 *            Crowded over sockets (socket_crowd), the bytes of ring, rd, hd and dbtree
 *            take ranks / CPUs as long (every rank copies and reduces in every step), and
 *            linear's too once a vector outgrows what a socket takes in (96 KiB): with
 *            them, 4 ranks on 2 CPUs, the model's ring took 6.5 ms at 4 MiB (measured
 *            5.6-7.6), hd 6.9 (7.0-8.3), linear 14.7 (11.4-13.7), hd at 64 KiB 187 us
 *            (127-217); without them 3.3, 3.4, 7.4 ms and 93 us. Linear is picked to 96
 *            KiB, then hd to 1 MiB, the ring beyond (session 68, with links on reno
 *            from their first packet; --algo all --fresh --window, 10 runs, medians of
 *            the runs' ratios: hd / linear 1.45-1.72 at 24-64 KiB, 1.26 at 96, 0.94 at
 *            128; rd / linear 1.01-1.23 at 24-96 KiB, 0.85 at 128. Sessions 61-67 had
 *            linear to 40 KiB, the fastest there at 32-40 KiB in 9 sweeps of 10, then
 *            rd to 55 KiB). At 256 KiB-1 MiB hd and the
 *            ring trade places: run one at a time (sockets warmed by the smaller sizes
 *            or not), hd was level or ahead at 1 MiB (ring / hd 0.76-1.63); with --algo
 *            all, after the smaller sizes, the ring was ahead (1.0-1.5 ms against
 *            1.4-2.1, 10 sweeps). Below 96 KiB linear's root copies at b/3
 *            (root_copy_b, session 61: 34.9 us at 16 KiB, the model 58.7 at b, 42.3 at
 *            b/3); the picks stay
 *            hier    (H hosts of S..M ranks, m = n/S: the shard each of S ranks per host
 *                    carries across, bl the local transport's beta)
 *                    2(M-1)(a + m bl) + (M-1) m g         (ring reduce-scatter and
 *                    allgather within the host; a is the slowest link's, as everywhere)
 *                    + min(ring, rd) of m bytes among H ranks with S b for b (the S
 *                    ranks of a host share its link); never chosen below 2 hosts or
 *                    with one rank per host (it would be the flat algorithm)
 * broadcast  tree    L (a + n b)
 *            chain   (p - 1 + c - 1)(a + min(n, chunk) b)
 *            linear  a + (p - 2) a/4 + (p - 1) n b   (the root sends to every rank; its
 *                    messages after the first cost their overhead only, as gather's).
 *                    Crowded, its latency counts as the barrier's (p - 1 messages), and
 *                    over sockets the root's queued ones count again (as the linear
 *                    barrier's: the tree keeps the pick there). Over shared memory
 *                    every receiver copies the message once (pulled from the root's
 *                    buffer from the CMA hint up, else out of its ring), the receivers
 *                    in parallel on the CPUs: (p - 1) / min(CPUs, p - 1) n b for linear
 *                    and a floor under the tree's and the chain's bytes. Crowded over
 *                    shm nothing is pulled (shm's auto), so linear's root also copies
 *                    the message into p - 1 rings, (p - 1) n at root_copy_b: linear to
 *                    87381 B at 4 ranks on 2 CPUs, then the tree. And crowded, the
 *                    chain's bytes count at ranks / CPUs (crowd_factor): every rank of
 *                    it copies in every step, so the pipeline does not overlap there.
 *                    4 ranks on 2 CPUs, p50 us, linear, tree, chain (3 runs, with
 *                    pulls): 4 B 0.24-0.43, 0.26-4.0, 0.26-4.2 (the tree and the chain
 *                    wait for an inner rank that may be off its CPU). Session 61, ab.sh
 *                    --fresh, 5 pairs, tree / linear over shm, --window: 64 KiB
 *                    1.05-1.08, 256 KiB 0.82 (0.77-1.12), 1 MiB 0.84-0.85, 4 MiB
 *                    0.57-0.69, 16-64 MiB 0.87-0.88, 256 MiB 0.79 (0.72-1.18); with
 *                    barriers 0.32-0.93 from 64 KiB, 256 MiB 1.06 (0.78-1.23). Chain /
 *                    tree: shm --window 1.46, 0.96, 1.31, 1.11, 1.01 at 256 KiB-64 MiB
 *                    (x4), barriers 2.89, 1.51, 0.99, 1.09, 1.05; tcp --window 1.25,
 *                    1.47, 1.10, 1.01, 1.03, barriers 0.86, 1.33, 1.59, 1.05, 0.92 (the
 *                    chain was picked over tcp from 1 MiB until then)
 * reduce     tree    L (a + n b + n g)
 *            ring    2(p-1) a + 2(p-1)/p n b + (p-1)/p n g
 *                    Crowded, the ring's reduce-scatter steps (every rank copies and
 *                    reduces a block) count their bytes at ranks / CPUs, and a tree
 *                    round's at its receivers / CPUs where they outnumber the CPUs: 4
 *                    ranks on 2 CPUs, the tree's rounds have 2 and 1 receivers, and it
 *                    goes from n 2 (b + g) against the ring's 1.5 n b + 0.75 n g to
 *                    level with it (1.5 n (b + g) + 0.75 n b). Measured (--fresh, p50
 *                    us, tree against ring): shm 32 KiB 27-29 against 76-101, 512 KiB
 *                    166-199 against 162-235, 4 MiB 1909-2006 against 1656-1713; tcp
 *                    128 KiB 136-283 against 208-280, 4 MiB 3823-4026 against
 *                    3399-3803: the ring is ahead from about 2 MiB only.
 *                    The tree's first round also has its senders at work (session 52)
 *                    once its messages outgrow the channel between the ranks (1 MiB:
 *                    the shm ring's default; below it a sender copies in and leaves):
 *                    its bytes then take 2 x receivers / CPUs at b (g stays with the
 *                    receivers), 2a + 3 n b + 2 n g at 4 ranks on 2 CPUs. With
 *                    --fresh, p50 us, tree, ring, the model's old and new tree: tcp 4
 *                    MiB 5674-7529, 4268-5906, 4913, 7010; shm 4 MiB 2997-3874,
 *                    2061-3141, 2379, 3218. The ring is picked above 1 MiB. Below,
 *                    the tree stays although with --fresh the ring was ahead over tcp
 *                    at 1 MiB (830-1496 against 1512-2052): back to back the tree's
 *                    calls overlap and it took 85 us at 256 KiB and 473 at 1 MiB
 *                    against the ring's 410 and 1304.
 *                    Over sockets on one host with a CPU a rank, the ring's steps count
 *                    their bytes twice (loop_copies: an exchange's two copies on each
 *                    rank's CPU), and at 2 ranks the tree wins at every size (tcp, p50
 *                    us, tree against ring, back to back: 1 MiB 142-190 against 332-584,
 *                    16 MiB 5386-7411 against 8470-9400; --fresh: 256 KiB 80-115
 *                    against 98-148, 4-16 MiB level)
 *                    Crowded, a step of the ring ends only when each rank of its
 *                    cycle has had a CPU: it takes ceil(ranks / CPUs) turns
 *                    (ring_turns), not ranks / CPUs. And a tree round after the
 *                    first whose sender is a leaf (2^j = p - 1: 3, 5, 9 ranks) has
 *                    its message written at the call's start, beside the root's
 *                    earlier rounds: the root copies it out at b/3 (as linear's
 *                    root does what its senders wrote and left). 3 ranks on 2 CPUs
 *                    (session 73, --algo all --fresh --window, 3 runs each, ring /
 *                    tree p50): tcp 1.5-2.0 at 128-512 KiB, 1.1-1.7 at 1-8 MiB,
 *                    0.98-1.16 at 16 MiB; shm 1.1-1.6 at 256 KiB-8 MiB, 0.98-1.44
 *                    at 16 MiB; the model had the ring above 96 KiB over tcp and
 *                    128 KiB over shm (where linear ends), now never at 3 ranks
 *                    (linear, then the tree). At 4 ranks both are as before
 *                    (ceil(4/2) = 2; no leaf round): the ring ahead from 2 MiB in
 *                    the same session (ring / tree 0.83-0.89 at 4-8 MiB). Crowded,
 *                    the ring's latency counts as the barrier's with its p (p - 1)
 *                    + p - 1 messages (as the allreduce's ring; 2 (p - 1) a until
 *                    session 73, which at 6 ranks on 2 CPUs over shm had it picked
 *                    at 64 KiB, where it took 2.3-2.7x linear's time and 2.1x the
 *                    tree's; the tree now); no pick at 3 or 4 ranks moves
 *            linear  a + (p-2) a/4 + (p-1) n (b + g)   (every rank to the root, which
 *                    reduces in rank order: an op that does not commute takes it);
 *                    crowded, latency as the linear allreduce's with p - 1 messages,
 *                    and over shm the root's copies at b/3 while its p - 1 vectors
 *                    fit its cache (256 KiB, root_copy_b), else at b: with b/3 at
 *                    every size the model took it over the ring at 3 ranks to 4 MiB,
 *                    where at 1 MiB it took 229 us against the ring's 184 (shm, 2
 *                    CPUs). 4 ranks on 2 CPUs over shm, linear / tree p50 (session
 *                    60, 5 alternating pairs): --window 0.72-0.76 at 1-16 KiB, level
 *                    at 64 KiB-1 MiB; --fresh 0.62-0.69 at 1-16 KiB, 0.91 at 64 KiB,
 *                    1.16 at 256 KiB: linear is picked to 85 KiB (with b for b/3
 *                    until session 60, to 900 bytes). Over tcp at 4 B-2 KiB the
 *                    two were level; crowded, its root copies at b/3 while each vector
 *                    fits a socket's buffer (root_copy_b), linear to 96 KiB (session
 *                    61, linear / tree, ab.sh --fresh, 5 pairs: --window 0.81-0.96 at
 *                    16 B-16 KiB, 0.93 at 64 KiB; barriers 0.67-0.81; session 68,
 *                    --window, 10 runs, medians of tree / linear 1.03-1.05 at 48-96 KiB,
 *                    1.01-1.06 at 128-192, 1.14 at 256; 40 KiB until then)
 * allgather  ring    (p-1)(a + n/p b)
 *            pairwise  on a crowded host only (every block posted at once;
 *                    algorithms/allgather_pairwise.c): all_posted_latency ((p-1) a
 *                    over shm, the shm alltoall's; over sockets the ring's less (p - 2)
 *                    a: the ring's steps wait p - 1 times for a peer's turn on a CPU,
 *                    its posts once) + 1.15 times the ring's bytes (p - 1 streams into
 *                    each rank at once, against the ring's one); over sockets 1.2 times
 *                    (session 64, ab.sh, 6-8 pairs, 4 ranks on 2 CPUs over tcp, pairwise
 *                    / ring: 0.70 at 64 KiB, 0.87 at 128, 1.01-1.18 at 256, 1.10-1.19 at
 *                    512, 1.10-1.24 at 1-16 MiB; 1.15 put the ring from 356 KB, now 267)
 *            rd      L a + (p-1)/p n b + n g     (Bruck: a local rotation at the end)
 *            linear  2 a + 2 (p-2) a/4 + (p-1)/p n b + (p-1) n b   (every block to rank
 *                    0, all of them back to each rank); on a crowded host the three
 *                    count their latency as the barrier's, with p (p-1), p L (p (p-1)
 *                    at powers of two: a block a message) and 2 (p-1) messages. 4
 *                    ranks on 2 CPUs, p50 us, linear, ring, rd: shm 16 B 3.4-3.8,
 *                    4.3-4.6, 6.7-7.3 (the model 3.5, 6, 5), 4 KiB 5.3-5.4, 5.5-6.0,
 *                    6.3-7.7; tcp 16 B 14.9, 32.9, 25.8 (30, 60, 60), 16 KiB 20.4,
 *                    35.7, 32.9. Over shm, crowded, the root copies at b/3 (in
 *                    its cache): the time grew 0.2 ns a byte from 16 to 64 KiB (the
 *                    model 0.25, at b 0.75). There pairwise is picked to 133 KB, then
 *                    the ring (4 ranks on 2 CPUs). Session 60, 5 alternating pairs,
 *                    pairwise / linear p50: --window 0.65-0.89 at 16 B-64 KiB; --fresh
 *                    (a barrier before each call) 1.08-1.09 at 16 B-1 KiB, level at 4-16
 *                    KiB, 0.91 at 64 KiB; ring / pairwise --window 1.04 at 64 KiB, 0.86
 *                    at 256 KiB, 0.96 at 1 MiB, 0.69 at 4 MiB, 0.92 at 16 MiB (large
 *                    messages streamed, no longer pulled: transports/shm/shm.h). Until
 *                    then pairwise counted the ring's latency and 0.9 b, and linear was
 *                    picked to 21.7 KB. Crowded over tcp (session 61; ab.sh --fresh
 *                    --window, 5 pairs, 4 ranks on 2 CPUs): pairwise / linear 1.23-1.57
 *                    at 4-32 KiB, 0.91 at 64 KiB; pairwise / ring 0.67 at 16-64 KiB,
 *                    0.88 at 256 KiB, 1.18 at 1 MiB, 1.05-1.19 at 4-16 MiB. Linear's
 *                    root copies there at b/3 while its messages fit a socket's buffer
 *                    (root_copy_b: it grew 1.1 n b from 16 to 64 KiB, the model's 3.75
 *                    n b had it 2x too slow at 16 KiB): linear to 57 KB (40 KiB, a
 *                    socket's buffer, sessions 61-67; session 68, 10 runs, medians of
 *                    pairwise / linear 1.15-1.17 at 32-48 KiB, 1.08 at 64, 0.94 at 96),
 *                    pairwise to 267 KB, then the ring (until session 61 linear to 20
 *                    KB, then the ring)
 *            hier    H hosts of S ranks each only (else never): (H-1) max(x, l) + l, x =
 *                    a + S n/p b (a step across hosts: a block from each of the host's S
 *                    ranks on its link), l = (S-1)(a + n/p bl) (a ring within the host
 *                    over one host's blocks, run while a step across is on its way)
 * reduce_scatter     ring and pairwise: (p-1)(a + n/p b + n/p g / k), k as above (the
 *                    blocks go in pieces, each reduced as it lands); pairwise talks to a
 *                    different peer each step, so its messages do not queue behind the
 *                    previous step's on one link: it gets a 0.9 factor on the b term.
 *                    Its latency is the ring's steps' (over shm the alltoall's, (p-1)
 *                    a): it posts every send at once, but over sockets, crowded, not
 *                    the allgather's (p-2) a less, as every block is reduced by its
 *                    receiver as it lands (session 68, tcp, 4 ranks on 2 CPUs, --algo
 *                    all --fresh --window, 10 runs, medians of pairwise / linear
 *                    1.13-1.16 at 24-32 KiB, 1.04 at 48, 0.97-0.99 at 64-96, 0.62-0.65
 *                    from 128: linear now to 63 KB, until then to 21). Over shm, 4 ranks
 *                    on 2 CPUs, pairwise / linear p50, session 60:
 *                    --window 0.70-0.91 at 16 B-16 KiB, 0.51 at 64 KiB; --fresh
 *                    1.08-1.11 at 16 B-1 KiB, 0.81-0.92 at 16-64 KiB; ring / pairwise
 *                    --window 0.96-1.07 at 256 KiB-16 MiB): pairwise at every size there,
 *                    where linear was picked to 8 KB
 *            linear  2 a + 2 (p-2) a/4 + (p-1) n (b + g) + (p-1)/p n b   (every input to
 *                    rank 0, which reduces them in turn and sends each rank its block).
 *                    On a crowded host the three count their latency as the barrier's,
 *                    p (p-1), p (p-1) and 2 (p-1) messages, and linear's root copies as
 *                    the allreduce's
 *            hier    as the allgather's, with n/p g more in x and in l's steps
 * gather/scatter     linear a + (p-2) a/4 + (p-1)/p n b   (the root's messages are all
 *                    in flight at once: each one after the first costs its overhead only)
 *            tree    L a + (p-1)/p n b + (L-1)/2 n g   (blocks are packed and forwarded)
 *            A crowded scatter over sockets counts both latencies as the barrier's, p - 1
 *            messages, and linear's root's queued sends again, as the linear broadcast's
 *            (on loopback a sender's system call carries its receiver's side too): 4
 *            ranks on 2 CPUs, 2a against the tree's 1.5a, the tree for blocks below a /
 *            (4 g). Back to back the tree took 13-24 us at 16 B-64 KiB against linear's
 *            22-29 (2 runs); with --fresh either is ahead by up to 50 % (3 runs: the
 *            tree's medians 15-35 against 14-32). A gather's root receives, its senders'
 *            CPUs carrying the loopback's work: linear stays (b2b 6-11 us against 7-13)
 * alltoall   pairwise (p-1)(a + n/p b); crowded over sockets its messages' share of the
 *                    CPUs, p (p-1) messages (over shm its one round of sends and receives,
 *                    all posted at once, stays (p-1) a: 4 ranks on 2 CPUs, n 256 B-4 KiB,
 *                    p50 7.1-10.8 us against Bruck's 11.6-15.5 in one run)
 *            ring    pairwise's latency + (p-1)/2 n b   (one exchange a step; the bytes
 *                    weighed as if they waited, so that the low-memory variant is picked
 *                    by name only), but on a crowded host over sockets pairwise's p - 1
 *                    streams into each rank at once cost more than the ring's one: there
 *                    the ring counts (p-1)/p n b and pairwise 1.15 times it, and the ring
 *                    takes pairwise's sizes. 4 ranks on 2 CPUs over tcp, pairwise / ring
 *                    p50, 4 runs of 3 (2 back to back, 2 --fresh): n 16-64 KiB 1.16-1.46
 *                    (0.92-1.64 over the repeats), 256 KiB-1 MiB 0.72-1.17 (--fresh
 *                    0.72-0.93, back to back 0.99-1.17), 4-16 MiB 1.05-1.35; the median
 *                    of the 24 cells 1.17 (session 35: the ring 10-30 % faster at 16-64
 *                    KiB). Session 61 (ab.sh --fresh --window, 5 pairs) measured the
 *                    other way: pairwise / ring 0.63-0.84 at 16-64 KiB, 0.97-1.02 at 256
 *                    KiB-4 MiB, 1.08 at 16 MiB; pairwise now counts the ring's latency
 *                    less (p - 2) a there (all_posted_latency: its posts wait for the
 *                    CPUs once, the ring's steps p - 1 times). Session 64 (ab.sh, 6
 *                    pairs, 4 ranks, --fresh --window), pairwise / ring: 0.63 at n 512
 *                    KiB, 0.71 at 1 MiB, 0.83 at 2, 1.01 at 4, 1.11 at 8, 1.15 at 16
 *                    (spreads 0.46-1.10 at 1 MiB, 1.11-1.20 at 16; a second run, 8
 *                    pairs: 0.73 at 1 MiB, 1.00 at 2, 1.11 at 4): the streams cost
 *                    nothing more until a block passes 512 KiB (TT_COST_STREAM_BYTES),
 *                    then 0.15 fr b a byte beyond p blocks of it. Pairwise takes blocks
 *                    of 13.3 KB (linear below) to 613 KB, the ring beyond
 *            bruck   L rounds of about half the blocks, p L messages: latency + L n/2 b,
 *                    and its copies into and out of the packed scratch, (L + 2) n at g (a
 *                    copy streams through the cache as a reduction does). 4 ranks on 2
 *                    CPUs over tcp, p50 us, n 256 B-16 KiB: 46-83 against pairwise's
 *                    54-143; 8 ranks, 256 B-64 KiB: 182-274 against 300-389
 *            linear  rows of p - 1 blocks to rank 0, columns back: 2 a + 2 (p-2) a/4
 *                    (crowded: 2 (p-1) messages, as the linear allgather's) + (p-1)/p n
 *                    (p-1) (b + g): rank 0 takes in and sends out (p-1)/p n per peer, each
 *                    byte counted once at b (on loopback a peer's system call copies its
 *                    side, on the other CPU: the root's time grew 0.16-0.29 ns a byte it
 *                    moved, about b/2 each way), and packs the columns at g. 4 ranks on
 *                    2 CPUs over tcp, p50 us, n 16 B-16 KiB: 28-49 against Bruck's 40-61
 *                    and pairwise's 44-83; 64 KiB 87-100 against the ring's 58-81. Over shm,
 *                    crowded, level with pairwise (6.4-9.0 against 7.0-9.9, and once 7.3
 *                    against 5.9): its rounds keep pairwise's one there. Crowded over
 *                    sockets its root copies at b/3 while its messages fit a socket's
 *                    buffer (root_copy_b; 16 KiB: 32.8 us against the model's 51.5 at
 *                    b): linear to blocks of 13.6 KB (pairwise / linear 1.07-1.27 at
 *                    4-32 KiB, 0.95 at 64 KiB)
 * scan and exscan    linear  (p - 1 + c - 1)(a + min(n, chunk)(b + g))   (a chain in
 *                    rank order in c chunks: each rank reduces its input into the prefix
 *                    it got and passes it on)
 *            rd      L a + L n b + (2 L - 1) n g   (MPICH's recursive doubling: a block
 *                    from below reduces into the result and the rank's block, the last
 *                    round's into the result only); crowded, both count their latency
 *                    as the barrier's, with (p - 1) c and p L messages, and rd's bytes
 *                    take ranks / CPUs as long (all its ranks copy and reduce at once,
 *                    where one rank of the chain works at a time). 4 ranks on 2 CPUs,
 *                    p50 us with --sync, linear against rd: shm 4 B 23.0 against 37.9,
 *                    16 KiB 137 against 326, 1 MiB 547 against 561; tcp 4 B 15.4
 *                    against 120, 128 KiB 78 against 528. Not crowded, 2 ranks: linear
 *                    ahead at every size (shm 1 MiB 78 against 98 before rd's last
 *                    round went one way only)
 * barrier    dissemination: L a; tree (binomial fan-in to rank 0 and back out): 2 L a;
 *            linear (every rank to rank 0 and back): 2 a + 2 (p - 2) a/4 (rank 0's
 *            messages after the first cost their overhead only, as gather's).
 *            On a crowded host (more ranks than CPUs, host_ranks and host_cpus) a
 *            message wakes a process that must wait for a CPU. Over sockets each
 *            message is system calls on both sides, and the CPUs are what costs: the
 *            host's share of the messages over its CPUs, p L for dissemination and
 *            2 (p - 1) for the trees, times a; linear adds rank 0's own 2 (p - 2)
 *            messages after the first at a/4, as they queue on its CPU. Measured on 2
 *            CPUs (tcp, p50 us, 3 runs each, dissemination against tree): 3 ranks
 *            12.0-12.4 against 8.9-10.7, 4 ranks 16.1-20.7 against 11.3-17.3, 8 ranks
 *            84-88 against 40-61; 2 ranks (not crowded) 2.8 against 5.6. Over shared
 *            memory (local_only) a message is a store and its sender's CPU hardly
 *            counts; what costs is each round's wait for a rank to be scheduled: the
 *            rounds times a, plus the host's share of the messages over its CPUs at
 *            a/2: dissemination L, tree 2 L, linear 2 rounds (shm, 2 CPUs, alpha 1
 *            us, p50 us: 4 ranks linear 2.2-3.5, dissemination 3.2-4.3, tree 3.6-5.5
 *            against the model's 3.5, 4 and 5.5; 8 ranks 5.5-9.2, 10.0-16.5, 19.8-23.9
 *            against 5.5, 9 and 9.5; a/10 until session 28 fitted the barrier no worse
 *            in its order, but put rd's allreduce and allgather at 2.4-2.6 against
 *            the measured 3.5-7.7). The trees let
 *            rank 0 out first, so a broadcast from it that follows starts at once.
 * Rooted collectives end with a handshake with the root (algorithms/handshake.c): with
 * TUTTI_AGREE_LAG=0, + a for reduce, gather and the scans (the root's release; a scan's
 * root is its last rank), + 2 a for broadcast
 * and scatter (confirm, release); by default it is checked later, off the call's path.
 * The same for every algorithm of a collective, so it never changes a choice; it counts
 * where latencies are compared across collectives (tt_comm_pack_below).
 *
 * These are the textbook (Thakur, Rabenseifner & Gropp 2005) costs. Alpha and beta come
 * from each transport's own hints (ABI v2 properties; the built-in ones were measured on
 * loopback TCP and shared memory on a 2-core VM); a cluster should use
 * TUTTI_COST_MODEL=probe or its own numbers. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <time.h>

#include <tutti/tutti.h>

#include "coll/cost.h"
#include "base/base.h"
#include "plugin/transport.h"
#include "reduce/reduce.h"

/* reduce: fp32 sum of two vectors into a third, per byte of vector (reduce-bench); the
 * same whatever the transport. A transport with no hints (a v1 plugin) counts as a
 * socket transport: tcp's numbers, measured with tutti-bench. */
#define COST_REDUCE_GBS 12.0
#define COST_DEFAULT_ALPHA_US 10.0
#define COST_DEFAULT_BW_GBS 2.0

void tt_cost_from_props(tt_cost_t *c, const char *transport,
                        const tutti_tp_props_v2_t *const *props, int n)
{
    /* "shm+tcp": every part counts, the slowest wins (a collective runs at its slowest
     * link) */
    const char *p = transport && *transport ? transport : "tcp";
    double best_a = 0, best_bw = 0;
    const char *best_name = NULL;
    size_t best_len = 0;
    int local_only = 1;
    for (int i = 0; *p; i++) {
        size_t len = strcspn(p, "+");
        const tutti_tp_props_v2_t *pr = i < n ? props[i] : NULL;
        if (!pr || !(pr->flags & TUTTI_TP_LOCAL_ONLY))
            local_only = 0;
        int hinted = pr && pr->alpha_us > 0 && pr->bw_gbs > 0;
        double a = hinted ? pr->alpha_us : COST_DEFAULT_ALPHA_US;
        double bw = hinted ? pr->bw_gbs : COST_DEFAULT_BW_GBS;
        if (!best_name || a + 1.0 / bw > best_a + 1.0 / best_bw) {
            best_a = a;
            best_bw = bw;
            best_name = hinted ? p : "tcp";
            best_len = hinted ? len : 3;
        }
        p += len + (p[len] == '+');
    }
    c->alpha_us = best_a;
    c->beta_ns = 1.0 / best_bw;
    /* with two parts the first serves this host's peers (tpmux.c names them so) */
    const tutti_tp_props_v2_t *lp = n > 1 && strchr(transport ? transport : "", '+') ? props[0]
                                                                                     : NULL;
    c->local_beta_ns = lp && lp->alpha_us > 0 && lp->bw_gbs > 0 ? 1.0 / lp->bw_gbs : 0;
    c->nhosts = c->lmin = c->lmax = 0; /* not known until tt_cost_set_hosts */
    c->host_ranks = c->host_cpus = 0;  /* not known until the transports count them */
    c->agree_lag = 0; /* the communicator's, set after (0: handshakes in the estimates) */
    c->local_only = local_only;
    c->gamma_ns = 1.0 / COST_REDUCE_GBS;
    snprintf(c->source, sizeof(c->source), "table %.*s", (int)best_len, best_name);
}

void tt_cost_table(tt_cost_t *c, const char *transport)
{
    const tutti_tp_props_v2_t *props[8];
    char name[64];
    int n = 0;
    for (const char *p = transport && *transport ? transport : "tcp"; *p && n < 8; n++) {
        size_t len = strcspn(p, "+");
        snprintf(name, sizeof(name), "%.*s", (int)len, p);
        props[n] = tt_transport_builtin_props(name);
        p += len + (p[len] == '+');
    }
    tt_cost_from_props(c, transport, props, n);
}

int tt_cost_parse(const char *spec, tt_cost_t *c, char *err, size_t errlen)
{
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", spec);
    size_t len = strlen(spec);
    if (!len || spec[0] == ',' || spec[len - 1] == ',' || strstr(spec, ",,")) {
        snprintf(err, errlen,
                 "TUTTI_COST_MODEL=\"%s\": empty item; expected table, probe, or "
                 "alpha=<us>,bw=<GB/s>,reduce=<GB/s> (positive numbers, any subset)",
                 spec);
        return TUTTI_ERR_CONFIG;
    }
    int params = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (!strcmp(tok, "table"))
            continue;
        if (!strncmp(tok, "tune=", 5) && tok[5]) {
            snprintf(c->tune, sizeof(c->tune), "%s", tok + 5);
            continue;
        }
        params++;
        char *eq = strchr(tok, '=');
        char *end = NULL;
        double v = eq ? strtod(eq + 1, &end) : 0;
        if (!eq || end == eq + 1 || *end || !(v > 0) || !isfinite(v)) {
            snprintf(err, errlen,
                     "TUTTI_COST_MODEL=\"%s\": cannot read \"%s\"; expected table, probe, "
                     "tune=<file> or alpha=<us>,bw=<GB/s>,reduce=<GB/s> (positive numbers, "
                     "any subset)",
                     spec, tok);
            return TUTTI_ERR_CONFIG;
        }
        *eq = 0;
        if ((!strcmp(tok, "bw") || !strcmp(tok, "reduce")) && !isfinite(1.0 / v)) {
            /* bw=1e-320: its inverse, the cost of a byte, is infinite, and 0 bytes of it
             * NaN in every estimate */
            snprintf(err, errlen,
                     "TUTTI_COST_MODEL=\"%s\": %s=%s is too small (its inverse, the time a "
                     "byte takes, is not finite); expected a positive number of GB/s",
                     spec, tok, eq + 1);
            return TUTTI_ERR_CONFIG;
        }
        if (!strcmp(tok, "alpha")) {
            c->alpha_us = v;
        } else if (!strcmp(tok, "bw")) {
            c->beta_ns = 1.0 / v;
        } else if (!strcmp(tok, "reduce")) {
            c->gamma_ns = 1.0 / v;
        } else {
            snprintf(err, errlen,
                     "TUTTI_COST_MODEL=\"%s\": unknown parameter \"%s\"; expected alpha, bw or "
                     "reduce",
                     spec, tok);
            return TUTTI_ERR_CONFIG;
        }
    }
    if (params)
        snprintf(c->source, sizeof(c->source), "user");
    return TUTTI_OK;
}

size_t tt_cost_chunk(size_t bytes, int nranks, size_t chunk_max)
{
    /* Pipelining needs a few chunks per block: aim for 4 per ring block, at most the
     * configured chunk, at least 256 KiB (smaller chunks cost more in per-message
     * overhead than they win in overlap; measured on loopback, 2 and 4 ranks). */
    const size_t lo = (size_t)256 << 10, n = (size_t)(nranks > 0 ? nranks : 1);
    if (bytes <= lo * 4 * n) /* no division on every small call */
        return TT_MIN(chunk_max, lo);
    return TT_MIN(chunk_max, TT_MAX(bytes / n / 4, lo));
}

static int ceil_log2(int p)
{
    int l = 0;
    while ((1 << l) < p)
        l++;
    return l;
}

void tt_cost_set_hosts(tt_cost_t *c, const int *host_of, int nranks)
{
    c->nhosts = c->lmin = c->lmax = 0;
    if (!host_of)
        return;
    for (int r = 0; r < nranks; r++)
        c->nhosts = TT_MAX(c->nhosts, host_of[r] + 1);
    for (int h = 0; h < c->nhosts; h++) {
        int l = 0;
        for (int r = 0; r < nranks; r++)
            l += host_of[r] == h;
        c->lmin = h == 0 ? l : TT_MIN(c->lmin, l);
        c->lmax = TT_MAX(c->lmax, l);
    }
}

int tt_cost_crowded(const tt_cost_t *c)
{
    return c->host_cpus > 0 && c->host_ranks > c->host_cpus;
}

/* The latency part of an algorithm of `rounds` rounds that sends `msgs` messages in
 * all, root_extra being what its root's queued messages add (the header's "crowded
 * host"): rounds a (+ root_extra) on a host with a CPU per rank; crowded, the host's
 * share of the messages over its CPUs, times a over sockets, and over shared memory
 * rounds a plus that share times a/2. */
static double latency(const tt_cost_t *c, int p, double rounds, double msgs, double root_extra)
{
    double a = c->alpha_us;
    if (!tt_cost_crowded(c))
        return rounds * a + root_extra;
    double cpu = msgs * TT_MIN(c->host_ranks, p) / p / c->host_cpus;
    return c->local_only ? rounds * a + cpu * a / 2 : cpu * a;
}

/* On a crowded host, ranks that all copy and reduce in the same round share the CPUs:
 * such a round's bytes take ranks / CPUs as long (a chain's step keeps one rank busy;
 * p: the ranks that work at once, of the host's share). Scan's rd, the reduce's tree
 * rounds, the allreduces (steps_crowd, socket_crowd) and the chain broadcast count it
 * (the header); the reduce's ring takes ring_turns. */
static double crowd_factor(const tt_cost_t *c, int p)
{
    return tt_cost_crowded(c) ? (double)TT_MIN(c->host_ranks, p) / c->host_cpus : 1;
}

/* A ring's step on a crowded host: every rank of the cycle waits for its left neighbour,
 * so the step ends when each has had a CPU, ceil(ranks / CPUs) turns (the header's
 * reduce: 3 ranks on 2 CPUs take 2 turns, as 4 do). The reduce's ring counts it so far;
 * the others keep crowd_factor */
static double ring_turns(const tt_cost_t *c, int p)
{
    return tt_cost_crowded(c) ? ceil((double)TT_MIN(c->host_ranks, p) / c->host_cpus) : 1;
}

/* The per-byte cost (us) of a linear root's copies of root_bytes in all, in messages of
 * up to msg_bytes: on a crowded host a third of b (b is a large buffer's stream through
 * a ring or a socket) while the receivers copy out on the other CPUs as it copies in,
 * or its senders wrote their messages and left (the header's linear allreduce,
 * allgather and reduce). Over shared memory while the root's bytes fit its cache
 * (TT_COST_ROOT_CACHE_BYTES); over sockets alone (not "shm+tcp") while each message fits
 * what a loopback socket takes in before its reader runs (TT_COST_SOCKET_BYTES, below):
 * beyond it a sender writes only as fast as the root reads. Else b. Its reductions
 * keep g. 96 KiB since session 68, when links came to run reno from their first
 * packet: 4 ranks on 2 CPUs over tcp, linear was the fastest allreduce at 32-96 KiB
 * (hd / linear medians 1.26-1.72, 10 runs), rd at 128 (linear / rd 1.18); 40 KiB
 * before (linear the fastest at 40 KiB in 6 runs of 6, at 48 KiB in 1, with every
 * loopback link paced by BBR). */
#define TT_COST_ROOT_CACHE_BYTES ((double)(256 << 10))
#define TT_COST_SOCKET_BYTES ((double)(96 << 10))
static double root_copy_b(const tt_cost_t *c, double root_bytes, double msg_bytes)
{
    double b = c->beta_ns * 1e-3;
    if (!tt_cost_crowded(c))
        return b;
    if (c->local_only)
        return root_bytes <= TT_COST_ROOT_CACHE_BYTES ? b / 3 : b;
    return !c->local_beta_ns && msg_bytes <= TT_COST_SOCKET_BYTES ? b / 3 : b;
}

/* How many times a step that sends and receives at once counts its bytes: twice over
 * sockets on one host (loopback) where every rank has a CPU, else once. b is a one-way
 * stream's: the sender's copy into the socket and the receiver's out of it, each on its
 * own CPU; in an exchange each rank's CPU makes both (the header's ring reduce). On a
 * crowded host crowd_factor prices the steps' CPUs instead; with a local transport of
 * its own (local_beta_ns: "shm+tcp") the host's peers are not reached over sockets. */
static double loop_copies(const tt_cost_t *c)
{
    return !c->local_only && !c->local_beta_ns && c->nhosts == 1 && !tt_cost_crowded(c) ? 2 : 1;
}

/* Does a tree round's sender stay on a CPU for its message, beside the receiver? Not
 * while the message fits what lies between them (the pair's shm ring, 1 MiB by default
 * up to 16 local peers; a loopback socket's buffers, more): the sender copies it in and
 * is free, and calls back to back overlap (a leaf is into its next call while the root
 * still reduces). Beyond it the sender copies only as fast as the receiver drains, and
 * on a crowded host the round has twice its receivers at work (the header's reduce;
 * crowd_factor is 1 elsewhere). */
#define TT_COST_CHANNEL_BYTES ((double)(1 << 20))

/* Crowded over sockets, the pairwise alltoall's p - 1 streams into each rank at once cost
 * no more than the ring's one exchange a step while a peer's block is up to this (4
 * ranks, pairwise / ring 0.71-0.73 at n 1 MiB, 0.83-1.00 at 2, 1.01-1.11 at 4 in two
 * runs of ab.sh); beyond, 15 % more a byte (the header's alltoall) */
#define TT_COST_STREAM_BYTES ((double)(512 << 10))
static int tree_senders_copy(double n)
{
    return n > TT_COST_CHANNEL_BYTES;
}

/* A crowded host whose peers are reached over sockets: not over shm, nor with a local
 * transport of its own beside them ("shm+tcp"). The allreduces' bytes, the scatter's
 * queued sends and the alltoall ring's steps are priced for it (the header). */
static int crowded_sockets(const tt_cost_t *c)
{
    return tt_cost_crowded(c) && !c->local_only && !c->local_beta_ns;
}

/* An allreduce there (the header's allreduce): linear's senders write their vectors and
 * are free while a vector fits what a loopback socket takes in before its reader runs
 * (its buffers as the kernel first sizes them; TT_COST_SOCKET_BYTES): the root alone
 * copies and reduces. Beyond it a sender writes only as fast as the root reads, and all
 * ranks are at work: its bytes take ranks / CPUs as long. */
static double socket_crowd(const tt_cost_t *c, int p)
{
    return crowded_sockets(c) ? crowd_factor(c, p) : 1;
}

/* An allreduce whose ranks all copy and reduce in every step (ring, rd, hd, dbtree) on a
 * crowded host, over sockets or over shm: its bytes take ranks / CPUs as long
 * (crowd_factor), as scan's rd (the header's allreduce; over shm since session 68).
 * Not with a local transport beside the sockets ("shm+tcp"), where it was not measured. */
static double steps_crowd(const tt_cost_t *c, int p)
{
    return c->local_only || crowded_sockets(c) ? crowd_factor(c, p) : 1;
}

/* The latency of p - 1 steps of one exchange each, as the alltoall's ring counts it: over
 * shm (p - 1) a (the header's alltoall), over sockets p - 1 rounds of p (p - 1)
 * messages. */
static double steps_latency(const tt_cost_t *c, int p)
{
    return c->local_only ? (p - 1) * c->alpha_us : latency(c, p, p - 1, p * (p - 1.0), 0);
}

/* The latency of an algorithm that posts all its p - 1 sends and receives at once (the
 * pairwise alltoall and allgather): the steps', no step waiting for the one before it
 * nor for a sender to get a CPU; on a crowded host over sockets (p - 2) a less, where
 * the ring's steps wait p - 1 times for a peer's turn on a CPU and these once (the
 * header's allgather). Not the pairwise reduce-scatter's: its receivers reduce each
 * block as it lands (the header's reduce_scatter). */
static double all_posted_latency(const tt_cost_t *c, int p)
{
    return steps_latency(c, p) - (crowded_sockets(c) ? (p - 2) * c->alpha_us : 0);
}

static double algo_cost(const tt_cost_t *c, tt_coll_t coll, const char *algo, size_t bytes, int p,
                        size_t chunk);

/* The step across hosts as the flat model sees it, on links shared by `sharers` ranks */
static double hier_cross(const tt_cost_t *c, double m, int nhosts, int sharers, size_t chunk,
                         int *rd_p)
{
    tt_cost_t x = *c;
    x.beta_ns *= sharers;
    x.nhosts = 0;
    double ring = algo_cost(&x, TT_COLL_ALLREDUCE, "ring", (size_t)m, nhosts, chunk);
    double rd = algo_cost(&x, TT_COLL_ALLREDUCE, "rd", (size_t)m, nhosts, chunk);
    *rd_p = rd < ring;
    return TT_MIN(ring, rd);
}

int tt_cost_hier_cross_rd(const tt_cost_t *c, size_t shard_bytes, int nhosts, int sharers,
                          size_t chunk)
{
    int rd = 0;
    if (nhosts > 1)
        hier_cross(c, (double)shard_bytes, nhosts, sharers, chunk, &rd);
    return rd;
}

int tt_cost_hier_segments(const tt_cost_t *c, size_t bytes, int nhosts, int sharers, size_t chunk)
{
    if (nhosts < 2 || nhosts > TT_HIER_MAX_HOSTS || sharers < 1 || bytes < 2 * TT_HIER_SEG_BYTES)
        return 1;
    size_t n = TT_MIN(bytes / TT_HIER_SEG_BYTES, (size_t)TT_HIER_MAX_SEGS);
    return tt_cost_hier_cross_rd(c, bytes / n / (size_t)sharers, nhosts, sharers, chunk) ? 1
                                                                                         : (int)n;
}

/* The local reduce-scatter and allgather, and the step across hosts; pipelined in k
 * segments, the two overlap but for one segment's worth of each (filling and draining) */
static double hier_cost(const tt_cost_t *c, double n, int p, size_t chunk)
{
    if (c->nhosts < 2 || c->lmax < 2 || c->nhosts > p)
        return HUGE_VAL;
    double a = c->alpha_us, g = c->gamma_ns * 1e-3;
    double bl = (c->local_beta_ns > 0 ? c->local_beta_ns : c->beta_ns) * 1e-3;
    double m = n / c->lmin, l1 = c->lmax - 1;
    int rd, k = tt_cost_hier_segments(c, (size_t)n, c->nhosts, c->lmin, chunk);
    double local = 2 * l1 * (a + m * bl) + l1 * m * g;
    double cross = hier_cross(c, m / k, c->nhosts, c->lmin, chunk, &rd) * k;
    if (k == 1)
        return local + cross;
    return TT_MAX(local, cross) + (local + cross) / k;
}

/* The hierarchical allgather (reduce 0) and reduce-scatter (reduce 1) of n bytes in all:
 * H - 1 steps across hosts of a block from each of a host's S ranks (they share its
 * link), and H rings within the host of S - 1 steps each, one of which runs while each
 * step across is on its way (the reduce-scatter's first, the allgather's last, alone) */
static double hier_ag_rs_cost(const tt_cost_t *c, double n, int p, int reduce)
{
    if (c->nhosts < 2 || c->lmin < 2 || c->lmin != c->lmax || c->nhosts * c->lmin != p)
        return HUGE_VAL;
    double a = c->alpha_us, b = c->beta_ns * 1e-3, g = c->gamma_ns * 1e-3;
    double bl = (c->local_beta_ns > 0 ? c->local_beta_ns : c->beta_ns) * 1e-3;
    double blk = n / p, H = c->nhosts, S = c->lmin;
    double cross = a + S * blk * b + (reduce ? blk * g : 0);
    double local = (S - 1) * (a + blk * bl + (reduce ? blk * g : 0));
    return (H - 1) * TT_MAX(cross, local) + local;
}

static double algo_cost(const tt_cost_t *c, tt_coll_t coll, const char *algo, size_t bytes, int p,
                        size_t chunk)
{
    double a = c->alpha_us, b = c->beta_ns * 1e-3, g = c->gamma_ns * 1e-3; /* us per byte */
    double n = (double)bytes;
    int L = ceil_log2(p);
    int lP = (1 << L) == p ? L : L - 1; /* log2 of the largest power of two <= p */
    double P = (double)(1 << lP);
    double x = (1 << L) == p ? 0 : 1;
    double fr = (double)(p - 1) / p;
    /* gather, scatter and alltoall envelopes carry the per-rank block */
    if (coll == TT_COLL_GATHER || coll == TT_COLL_SCATTER || coll == TT_COLL_ALLTOALL)
        n *= p;
    double chunks = chunk ? ceil(n / (double)chunk) : 1;
    if (chunks < 1)
        chunks = 1;
    /* chunks of a ring block that pipeline, at most 4: reducing one overlaps the next's
     * transfer (the ring allreduce and the reduce-scatters) */
    double k = chunk ? ceil(n / p / (double)chunk) : 1;
    k = k < 1 ? 1 : k > 4 ? 4 : k;
    switch (coll) {
    case TT_COLL_ALLREDUCE:
        if (!strcmp(algo, "ring")) /* 2 (p - 1) messages a rank */
            return latency(c, p, 2.0 * (p - 1), 2.0 * p * (p - 1), 0) +
                   steps_crowd(c, p) * (2 * fr * n * b + fr * n * g / k);
        if (!strcmp(algo, "rd")) /* P lP messages in the rounds, 2 (p - P) to fold */
            return latency(c, p, lP + 2 * x, P * lP + 2.0 * (p - P), 0) +
                   steps_crowd(c, p) * (lP * (n * b + n * g) + x * (2 * n * b + n * g));
        if (!strcmp(algo, "linear")) /* rank 0 takes in and reduces p - 1 vectors in turn */
            return latency(c, p, 2, 2.0 * (p - 1), 2.0 * (p - 2) * a / 4) +
                   (n > TT_COST_SOCKET_BYTES ? socket_crowd(c, p) : 1) * (p - 1) * n *
                       (root_copy_b(c, (p - 1) * n, n) + g);
        if (!strcmp(algo, "hd")) /* 2 P lP messages in the rounds */
            return latency(c, p, 2 * lP + 2 * x, 2 * P * lP + 2.0 * (p - P), 0) +
                   steps_crowd(c, p) *
                       (2 * (P - 1) / P * n * b + (P - 1) / P * n * g + x * (2 * n * b + n * g));
        if (!strcmp(algo, "dbtree")) /* each chunk up and down two trees */
            return latency(c, p, 2 * (L + chunks - 1), 4.0 * (p - 1) * chunks, 0) +
                   steps_crowd(c, p) * (2 * n * b + n * g);
        if (!strcmp(algo, "hier"))
            return hier_cost(c, n, p, chunk);
        break;
    case TT_COLL_BROADCAST: {
        /* over shared memory every receiver copies the message once, and at most a CPU
         * each copy at a time: no broadcast moves its bytes faster than that */
        double cpus = c->host_cpus > 0 ? TT_MIN((double)c->host_cpus, p - 1.0) : p - 1.0;
        double floor_b = c->local_only ? (p - 1) / cpus * n * b : 0;
        if (!strcmp(algo, "tree"))
            return L * a + TT_MAX(L * n * b, floor_b);
        if (!strcmp(algo, "chain")) /* crowded, every rank copies in every step */
            return (p - 1 + chunks - 1) * a +
                   TT_MAX((p - 1 + chunks - 1) * TT_MIN(n, (double)(chunk ? chunk : bytes)) * b *
                              crowd_factor(c, p),
                          floor_b);
        if (!strcmp(algo, "linear")) { /* the root's sends queue on its socket or ring */
            /* crowded over shm nothing is pulled (shm's auto), so the root copies the
             * message into every receiver's ring itself: (p - 1) n at root_copy_b. Over
             * sockets b (its queued sends lost to the tree at b/3 too: the header) */
            double root_b = c->local_only && tt_cost_crowded(c)
                                ? (p - 1) * n * root_copy_b(c, (p - 1) * n, n)
                                : 0;
            return latency(c, p, 1, p - 1.0, (p - 2) * a / 4) +
                   (tt_cost_crowded(c) && !c->local_only ? (p - 2) * a / 4 : 0) +
                   (c->local_only ? TT_MAX(floor_b, root_b) : (p - 1) * n * b);
        }
        break;
    }
    case TT_COLL_REDUCE:
        if (!strcmp(algo, "tree")) { /* round j: the ranks that receive share the CPUs */
            double t = 0;
            const int senders_copy = tree_senders_copy(n);
            for (int j = 0; j < L; j++) {
                int receivers = (p - 1 - (1 << j)) / (2 << j) + 1;
                /* crowded, a leaf's message, written at the start (the header) */
                if (j > 0 && (1 << j) == p - 1 && tt_cost_crowded(c)) {
                    t += a + n * (b / 3 + g);
                    continue;
                }
                double copy = crowd_factor(c, senders_copy ? 2 * receivers : receivers);
                t += a + n * (b * TT_MAX(1.0, copy) + g * TT_MAX(1.0, crowd_factor(c, receivers)));
            }
            return t;
        }
        if (!strcmp(algo, "ring")) /* every rank in the ring's steps, the root gathers */
            return latency(c, p, 2.0 * (p - 1), p * (p - 1.0) + (p - 1), 0) +
                   ring_turns(c, p) * fr * n * (loop_copies(c) * b + g) + fr * n * b;
        if (!strcmp(algo, "linear")) /* the root takes in and reduces p - 1 vectors */
            return latency(c, p, 1, p - 1.0, (p - 2) * a / 4) +
                   (p - 1) * n * (root_copy_b(c, (p - 1) * n, n) + g);
        break;
    case TT_COLL_SCAN:
    case TT_COLL_EXSCAN:
        if (!strcmp(algo, "linear")) { /* a chain of p - 1 links, chunks pipelined */
            double steps = p - 1 + chunks - 1;
            return latency(c, p, steps, (p - 1) * chunks, 0) +
                   steps * TT_MIN(n, (double)(chunk ? chunk : bytes)) * (b + g);
        }
        if (!strcmp(algo, "rd")) /* every rank copies and reduces each round */
            return latency(c, p, L, (double)p * L, 0) +
                   crowd_factor(c, p) * (L * n * b + (2 * L - 1) * n * g);
        break;
    case TT_COLL_ALLGATHER:
        if (!strcmp(algo, "ring"))
            return latency(c, p, p - 1, (double)p * (p - 1), 0) + fr * n * b;
        if (!strcmp(algo, "rd"))
            /* powers of two send each block alone: p - 1 messages a rank */
            return latency(c, p, L, (1 << L) == p ? (double)p * (p - 1) : (double)p * L, 0) +
                   fr * n * b + n * g;
        if (!strcmp(algo, "linear")) /* rank 0 takes in n (p-1)/p, sends n to p - 1 ranks */
            return latency(c, p, 2, 2.0 * (p - 1), 2.0 * (p - 2) * a / 4) +
                   (fr + p - 1) * n * root_copy_b(c, (fr + p - 1) * n, n);
        if (!strcmp(algo, "hier"))
            return hier_ag_rs_cost(c, n, p, 0);
        /* the ring's messages, all posted at once, on a crowded host: all_posted_latency
         * (no step waits for the one before it to land, nor for its sender to get a
         * CPU), and 1.15 times the ring's bytes over shm, 1.2 over sockets, for its p - 1
         * streams into each rank at once against the ring's one (the header's allgather;
         * over sockets it took 1.10-1.24x the ring's time at 512 KiB-16 MiB). Not
         * where every rank has a CPU (not measured: the ring's steps then wait for no
         * CPU), nor with shm beside tcp. At 2 ranks it is the ring's one exchange: left
         * to the ring */
        if (!strcmp(algo, "pairwise") && (c->local_only || crowded_sockets(c)) &&
            tt_cost_crowded(c) && p > 2)
            return all_posted_latency(c, p) + (c->local_only ? 1.15 : 1.2) * fr * n * b;
        break;
    case TT_COLL_REDUCE_SCATTER:
        if (!strcmp(algo, "ring"))
            return latency(c, p, p - 1, (double)p * (p - 1), 0) +
                   (p - 1) * (n / p * b + n / p * g / k);
        if (!strcmp(algo, "pairwise")) /* the steps' latency (the header) */
            return steps_latency(c, p) + (p - 1) * (0.9 * n / p * b + n / p * g / k);
        if (!strcmp(algo, "linear")) /* rank 0 takes in p - 1 inputs, sends fr n out */
            return latency(c, p, 2, 2.0 * (p - 1), 2.0 * (p - 2) * a / 4) +
                   (p - 1) * n * (root_copy_b(c, (p - 1) * n, n) + g) +
                   fr * n * root_copy_b(c, (p - 1) * n, n);
        if (!strcmp(algo, "hier"))
            return hier_ag_rs_cost(c, n, p, 1);
        break;
    case TT_COLL_GATHER:
    case TT_COLL_SCATTER: {
        /* a crowded scatter over sockets: as the linear broadcast's, the root's sends
         * queue on its CPU and count again; both count their p - 1 messages over the CPUs
         * (a gather's root receives, and the senders' CPUs carry the loopback's work) */
        const int queued = coll == TT_COLL_SCATTER && crowded_sockets(c);
        if (!strcmp(algo, "linear")) /* the root posts every message at once */
            return (queued ? latency(c, p, 1, p - 1.0, 0) : a) + (p - 2) * a / 4 + fr * n * b;
        if (!strcmp(algo, "tree"))
            return (queued ? latency(c, p, L, p - 1.0, 0) : L * a) + fr * n * b +
                   (L - 1) / 2.0 * n * g;
        break;
    }
    case TT_COLL_ALLTOALL: {
        /* pairwise and ring: p - 1 messages a rank; the ring's steps wait each for the
         * one before (over shm both count (p - 1) a: the header's alltoall). Crowded over
         * sockets, pairwise's p - 1 streams at once against the ring's one exchange a
         * step: the header's alltoall */
        const int one_a_step = crowded_sockets(c);
        if (!strcmp(algo, "pairwise")) /* its streams' extra over the ring's bytes */
            return all_posted_latency(c, p) + fr * n * b +
                   (one_a_step ? 0.15 * fr * TT_MAX(0.0, n - p * TT_COST_STREAM_BYTES) * b : 0);
        if (!strcmp(algo, "ring"))
            return steps_latency(c, p) + (one_a_step ? fr : (p - 1) / 2.0) * n * b;
        if (!strcmp(algo, "bruck"))
            return latency(c, p, L, (double)p * L, 0) + L * n / 2 * b + (L + 2) * n * g;
        if (!strcmp(algo, "linear")) /* rank 0 takes in p - 1 rows, packs and sends columns */
            return latency(c, p, 2, 2.0 * (p - 1), 2.0 * (p - 2) * a / 4) +
                   (p - 1) * fr * n * (root_copy_b(c, (p - 1) * fr * n, fr * n) + g);
        break;
    }
    case TT_COLL_BARRIER: {
        int tree = !strcmp(algo, "tree"), linear = !strcmp(algo, "linear");
        if (!tree && !linear && strcmp(algo, "dissemination"))
            break;
        double rounds = tree ? 2.0 * L : linear ? 2 : L;
        double msgs = tree || linear ? 2.0 * (p - 1) : (double)p * L;
        double root_extra = linear ? 2.0 * (p - 2) * a / 4 : 0; /* rank 0's queued messages */
        /* crowded over sockets, the host's share already counts rank 0's messages; they
         * count again for the linear one there, so that the tree (as many messages) keeps
         * rank 0's releases off the path of the rooted call behind the barrier */
        return latency(c, p, rounds, msgs, root_extra) +
               (tt_cost_crowded(c) && !c->local_only ? root_extra : 0);
    }
    default: break;
    }
    return HUGE_VAL; /* an algorithm the model does not know is never picked by it */
}

double tt_cost_estimate(const tt_cost_t *c, tt_coll_t coll, const char *algo, size_t bytes, int p,
                        size_t chunk)
{
    if (p <= 1)
        return 0;
    /* waited for in the call only (agree_lag 0); else it overlaps the calls after */
    const int release = coll == TT_COLL_REDUCE || coll == TT_COLL_GATHER || coll == TT_COLL_SCAN ||
                        coll == TT_COLL_EXSCAN;
    const int both = coll == TT_COLL_BROADCAST || coll == TT_COLL_SCATTER;
    double handshake = c->agree_lag > 0 ? 0 : release ? 1 : both ? 2 : 0;
    return algo_cost(c, coll, algo, bytes, p, chunk) + handshake * c->alpha_us;
}

void tt_cost_describe(const tt_cost_t *c, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%s: alpha %.2f us, bw %.2f GB/s, reduce %.2f GB/s", c->source,
                     c->alpha_us, 1.0 / c->beta_ns, 1.0 / c->gamma_ns);
    if (c->nhosts > 1 && n > 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, "; %d hosts of %d..%d ranks, local bw %.2f GB/s",
                      c->nhosts, c->lmin, c->lmax,
                      1.0 / (c->local_beta_ns > 0 ? c->local_beta_ns : c->beta_ns));
    if (tt_cost_crowded(c) && n > 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, "; crowded: %d ranks on %d CPU%s", c->host_ranks,
                 c->host_cpus, c->host_cpus == 1 ? "" : "s");
}
