// oldclients: the admin calls of two old Go Kafka clients, as Debian packages them (Sarama
// 1.22.1, golang-github-shopify-sarama-dev; segmentio/kafka-go 0.2.1,
// golang-github-segmentio-kafka-go-dev). Neither sends ApiVersions: Sarama set to Kafka
// 0.10.2 sends CreateTopics v0, set to 0.11 DescribeConfigs v0 (the only version it has; it
// refuses the call itself below 0.11); kafka-go 0.2 sends CreateTopics v0. Built in GOPATH mode from /usr/share/gocode (no download), driven by
// tests/e2e/test_old_go_clients.py; prints one JSON object.
//
//	oldclients sarama-create   BOOTSTRAP TOPIC
//	oldclients sarama-describe BOOTSTRAP TOPIC
//	oldclients kafkago-create  BOOTSTRAP TOPIC
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/Shopify/sarama"
	kafka "github.com/segmentio/kafka-go"
)

func admin(bootstrap string, version sarama.KafkaVersion) (sarama.ClusterAdmin, error) {
	conf := sarama.NewConfig()
	conf.Version = version
	conf.ClientID = "sarama-1.22"
	conf.Net.DialTimeout = 10 * time.Second
	conf.Net.ReadTimeout = 20 * time.Second
	conf.Metadata.Retry.Max = 2
	return sarama.NewClusterAdmin([]string{bootstrap}, conf)
}

func run(mode, bootstrap, topic string) (map[string]interface{}, error) {
	switch mode {
	case "sarama-create":
		// An application written for Kafka 0.10.2: CreateTopics v0.
		ca, err := admin(bootstrap, sarama.V0_10_2_0)
		if err != nil {
			return nil, err
		}
		defer ca.Close()
		err = ca.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false)
		if err != nil {
			return nil, err
		}
		return map[string]interface{}{"created": topic}, nil
	case "sarama-describe":
		// For Kafka 0.11: DescribeConfigs v0.
		ca, err := admin(bootstrap, sarama.V0_11_0_0)
		if err != nil {
			return nil, err
		}
		defer ca.Close()
		entries, err := ca.DescribeConfig(sarama.ConfigResource{Type: sarama.TopicResource, Name: topic})
		if err != nil {
			return nil, err
		}
		configs := map[string]string{}
		for _, entry := range entries {
			configs[entry.Name] = entry.Value
		}
		return map[string]interface{}{"configs": configs}, nil
	case "kafkago-create":
		conn, err := (&kafka.Dialer{Timeout: 10 * time.Second}).Dial("tcp", bootstrap)
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(20 * time.Second))
		err = conn.CreateTopics(kafka.TopicConfig{Topic: topic, NumPartitions: 1, ReplicationFactor: 1})
		if err != nil {
			return nil, err
		}
		return map[string]interface{}{"created": topic}, nil
	}
	return nil, fmt.Errorf("unknown mode %q", mode)
}

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: oldclients MODE BOOTSTRAP TOPIC")
		os.Exit(2)
	}
	result, err := run(os.Args[1], os.Args[2], os.Args[3])
	if err != nil {
		// An error is an answer too (the test tells a broker's error from a closed connection).
		result = map[string]interface{}{"error": err.Error()}
	}
	out, _ := json.Marshal(result)
	fmt.Println(string(out))
}
