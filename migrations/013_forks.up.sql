-- Where a forked run came from (workflow.Engine.RunFork): the run it copied and how many of that
-- run's steps it copied, for operators (idem runs show, idemui), so that a copied step is told
-- from the run's own by its position, not guessed from its time. NULL for every other run, which
-- costs a row nothing but its null bitmap's bits.
ALTER TABLE idem_runs
    ADD COLUMN forked_scope text COLLATE "C",
    ADD COLUMN forked_id    text COLLATE "C",
    ADD COLUMN forked_steps integer;
