// Command franzprobe is franz-go (github.com/twmb/franz-go), driven by the Python tests through
// the Sluice proxy: `produce` sends the lines of stdin as records (idempotent, franz-go's
// default), `consume` reads COUNT records in a consumer group. Prints one JSON object.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: franzprobe produce|consume -bootstrap HOST:PORT -topic T [...]")
		os.Exit(2)
	}
	mode := os.Args[1]
	flags := flag.NewFlagSet(mode, flag.ExitOnError)
	bootstrap := flags.String("bootstrap", "", "HOST:PORT")
	topic := flags.String("topic", "", "topic")
	group := flags.String("group", "", "consumer group (consume)")
	count := flags.Int("count", 0, "records to read (consume)")
	timeout := flags.Duration("timeout", 30*time.Second, "give up after")
	_ = flags.Parse(os.Args[2:])
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var out map[string]any
	var err error
	switch mode {
	case "produce":
		out, err = produce(ctx, *bootstrap, *topic)
	case "consume":
		out, err = consume(ctx, *bootstrap, *topic, *group, *count)
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "franzprobe:", err)
		os.Exit(1)
	}
	_ = json.NewEncoder(os.Stdout).Encode(out)
}

func produce(ctx context.Context, bootstrap, topic string) (map[string]any, error) {
	client, err := kgo.NewClient(kgo.SeedBrokers(bootstrap), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return nil, err
	}
	defer client.Close()
	var records []*kgo.Record
	scanner := bufio.NewScanner(os.Stdin)
	for scanner.Scan() {
		records = append(records, &kgo.Record{Value: []byte(scanner.Text()), Partition: 0})
	}
	offsets := []int64{}
	for _, r := range client.ProduceSync(ctx, records...) {
		if r.Err != nil {
			return nil, r.Err
		}
		offsets = append(offsets, r.Record.Offset)
	}
	return map[string]any{"offsets": offsets}, nil
}

func consume(ctx context.Context, bootstrap, topic, group string, count int) (map[string]any, error) {
	client, err := kgo.NewClient(kgo.SeedBrokers(bootstrap), kgo.ConsumeTopics(topic),
		kgo.ConsumerGroup(group), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit())
	if err != nil {
		return nil, err
	}
	defer client.Close()
	values := []string{}
	for len(values) < count {
		fetches := client.PollFetches(ctx)
		if ctx.Err() != nil {
			break
		}
		if errs := fetches.Errors(); len(errs) > 0 {
			return nil, errs[0].Err
		}
		fetches.EachRecord(func(r *kgo.Record) { values = append(values, string(r.Value)) })
	}
	commitCtx, done := context.WithTimeout(context.Background(), 15*time.Second)
	defer done()
	if err := client.CommitUncommittedOffsets(commitCtx); err != nil {
		return nil, err
	}
	return map[string]any{"values": values}, nil
}
